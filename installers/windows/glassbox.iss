; Inno Setup 6 script for Glassbox (Windows). Built by installers/build.py on Windows:
;   iscc /DAppVersion=0.1.0 /DSourceDir=dist\glassbox /DOutputDir=dist [/DIconFile=build\icon\glassbox.ico] installers\windows\glassbox.iss
; Installs the one-folder bundle under Program Files, a Start menu entry and an uninstaller.
; User data (chats, models, knowledge bases, settings) lives in %LOCALAPPDATA%\Glassbox and is
; never touched by upgrading or uninstalling.

#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#ifndef SourceDir
  #define SourceDir "..\..\dist\glassbox"
#endif
#ifndef OutputDir
  #define OutputDir "..\..\dist"
#endif

[Setup]
; The AppId identifies the app across versions (upgrades replace, never duplicate): never change it.
AppId={{74CEC7F2-60DD-4FE1-95ED-B93E94426A87}
AppName=Glassbox
AppVersion={#AppVersion}
AppVerName=Glassbox {#AppVersion}
AppPublisher=Glassbox maintainers
DefaultDirName={autopf}\Glassbox
DefaultGroupName=Glassbox
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir={#OutputDir}
OutputBaseFilename=glassbox-{#AppVersion}-windows-setup
Compression=lzma2/fast
SolidCompression=no
WizardStyle=modern
UninstallDisplayName=Glassbox
UninstallDisplayIcon={app}\glassbox.exe
#ifdef IconFile
SetupIconFile={#IconFile}
#endif

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\Glassbox"; Filename: "{app}\glassbox.exe"
Name: "{group}\Uninstall Glassbox"; Filename: "{uninstallexe}"
Name: "{autodesktop}\Glassbox"; Filename: "{app}\glassbox.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\glassbox.exe"; Description: "{cm:LaunchProgram,Glassbox}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; Only what the app itself may leave in its install folder (byte-code caches); never user data.
Type: filesandordirs; Name: "{app}\_internal\__pycache__"
